"""``python -m service``: run the gateway with uvicorn (one process; see service.api.app)."""

from __future__ import annotations

import logging

import uvicorn

from service.api.app import create_app
from service.state.config import Settings
from service.state.lifeline import tie_to_parent


def main() -> None:
    tie_to_parent()  # started by make serve or a benchmark: dies with it
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    settings = Settings()
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, workers=1,
                log_level="info", access_log=settings.access_log)


if __name__ == "__main__":
    main()
