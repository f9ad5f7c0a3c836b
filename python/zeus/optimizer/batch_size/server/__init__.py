"""Batch size optimizer server: FastAPI + SQLAlchemy (async), state in the database.

Run it with `zeus-bso-server` (see `cli.py`) or build the ASGI app with `app.create_app()`.
"""
