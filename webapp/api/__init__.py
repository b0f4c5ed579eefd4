"""JSON API blueprints (the README's HTTP API section is their contract)."""
