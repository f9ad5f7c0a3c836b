"""Perseus server: `router.app` (FastAPI), `JobManager`, and the frequency schedulers."""
