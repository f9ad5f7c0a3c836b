"""Batch size optimizer server: an ASGI app over SQLite or PostgreSQL, state in the database.

Run it with `zeus-bso-server` (see `cli.py`) or build the ASGI app with `app.create_app()`.
"""
