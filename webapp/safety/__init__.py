"""The output rail as the chat serves it: rules and interventions in the database, the admin's Safety page."""
