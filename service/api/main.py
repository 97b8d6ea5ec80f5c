"""The versioned API (every route under /v1)."""

from fastapi import APIRouter

from service.api.routes import galleries, items, jobs, models, search

api_router = APIRouter()
api_router.include_router(search.router)
api_router.include_router(galleries.router)
api_router.include_router(items.router)
api_router.include_router(models.router)
api_router.include_router(jobs.router)
