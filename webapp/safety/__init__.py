"""The output rail (issue 17): rules and interventions in the database, the admin's Safety page."""
