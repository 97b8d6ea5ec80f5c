#!/bin/sh
# Entrypoint of the gateway and worker images: unset every NOBACKFILL_* variable that is set
# but empty, then run the command. docker-compose.yml passes optional settings as
# `${NOBACKFILL_X:-}`, which arrives as an empty string, and pydantic-settings would read ""
# as a value (an empty path, an empty API key, invalid JSON) instead of "not set".
set -eu
for name in $(env | sed -n 's/^\(NOBACKFILL_[A-Za-z0-9_]*\)=$/\1/p'); do
    unset "$name"
done
exec "$@"
