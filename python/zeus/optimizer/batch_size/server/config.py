"""Server settings, from `ZEUS_BSO_*` environment variables (and a `.env` file if present)."""

from __future__ import annotations

import logging
from typing import Optional

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_DATABASE_URL = "sqlite+aiosqlite:///zeus_bso.db"


class ZeusBsoSettings(BaseSettings):
    """Settings of the batch size optimizer server.

    Attributes:
        database_url: Async SQLAlchemy URL (`ZEUS_BSO_DATABASE_URL`), e.g.
            `sqlite+aiosqlite:///zeus_bso.db` (the default, a file in the working directory) or
            `postgresql+asyncpg://user:pw@host/db`.
        auto_migrate: Apply the migrations at start-up (`ZEUS_BSO_AUTO_MIGRATE`). Unset means
            yes for SQLite and no otherwise (run `zeus-bso-server migrate` once instead).
        token: Bearer token every request must carry (`ZEUS_BSO_TOKEN`), the API documentation
            included; unset or empty means no auth. Printable ASCII without leading or trailing
            blanks (it travels in a header).
        public_docs: Serve `/docs`, `/redoc` and `/openapi.json` without the token
            (`ZEUS_BSO_PUBLIC_DOCS`); the API itself still needs it.
        echo_sql: Log every SQL statement (`ZEUS_BSO_ECHO_SQL`).
        log_level: Level of the server's loggers (`ZEUS_BSO_LOG_LEVEL`).
        pool_size: Database connections per server process (`ZEUS_BSO_POOL_SIZE`); SQLite
            always uses one, since its writers serialise anyway.
        max_keepalive: Each server process keeps connections open between requests while at
            most this many distinct connections sent requests in the last 5 s
            (`ZEUS_BSO_MAX_KEEPALIVE`); busier than that, every response closes its
            connection. 0 always closes. See `keepalive.py` for why.

    """

    model_config = SettingsConfigDict(env_prefix="ZEUS_BSO_", env_file=".env", extra="ignore")

    database_url: str = DEFAULT_DATABASE_URL
    auto_migrate: Optional[bool] = None
    token: Optional[str] = None
    public_docs: bool = False
    echo_sql: bool = False
    log_level: str = "INFO"
    pool_size: int = Field(default=10, gt=0)
    max_keepalive: int = Field(default=8, ge=0)

    @field_validator("log_level")
    @classmethod
    def _known_level(cls, level: str) -> str:
        # Like the reference: an unknown level name falls back to INFO rather than failing.
        level = level.upper()
        return level if isinstance(logging.getLevelName(level), int) else "INFO"

    @field_validator("token")
    @classmethod
    def _header_safe_token(cls, token: Optional[str]) -> Optional[str]:
        if not token:
            return None
        if not (token.isascii() and token.isprintable()) or token != token.strip():
            raise ValueError("the token must be printable ASCII without leading or trailing blanks")
        return token

    @property
    def is_sqlite(self) -> bool:
        """Whether the database is SQLite."""
        return self.database_url.startswith("sqlite")

    @property
    def should_migrate(self) -> bool:
        """Whether to migrate at start-up."""
        return self.is_sqlite if self.auto_migrate is None else self.auto_migrate
