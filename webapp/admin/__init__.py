"""The admin side: login, the dashboard pages, the admin JSON API, charts, the feedback browser."""
