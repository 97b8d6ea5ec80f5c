"""``python -m service``: run the gateway with uvicorn (one process; see service.main)."""

from __future__ import annotations

import logging

import uvicorn

from service.core.config import Settings
from service.main import create_app


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    settings = Settings()
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, workers=1,
                log_level="info", access_log=settings.access_log)


if __name__ == "__main__":
    main()
