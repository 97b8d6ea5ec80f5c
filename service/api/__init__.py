"""The HTTP layer: routes, request/response schemas, dependencies, error mapping."""

# Each router carries the version prefix itself (not via include_router) so the route
# template seen in the ASGI scope, which labels metrics, is the full public path.
API_V1 = "/v1"
