"""JSON API blueprints (see DESIGN.md "HTTP contract")."""
