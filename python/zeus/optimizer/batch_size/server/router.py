"""The reference's serve command keeps working.

`uvicorn zeus.optimizer.batch_size.server.router:app` serves the same application. It reads its
settings from `ZEUS_BSO_*` environment variables when this module is imported; the database
opens at start-up (ASGI lifespan).
"""

from zeus.optimizer.batch_size.server.app import create_app

app = create_app()
