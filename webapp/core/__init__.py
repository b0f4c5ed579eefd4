"""What every feature stands on: settings, the database and its tables, identity, errors,
request validation, security headers and rate limits, locks, the audit log. Imports no feature."""
