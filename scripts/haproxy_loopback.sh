#!/bin/sh
# Start Ray Serve's HAProxy with every listener on 127.0.0.1.
#
# Ray's HAProxy template binds its stats and metrics listeners to all interfaces ("bind *:PORT",
# "bind :PORT") with no setting to change that. Ray starts (and, to reload, restarts) HAProxy as
# `haproxy -db -f CONFIG ...`; this wrapper, named by RAY_SERVE_HAPROXY_BINARY_PATH, rewrites those
# bind lines in CONFIG to 127.0.0.1 and then becomes the real binary (exec keeps the PID Ray tracks).
# The Serve HTTP frontend already binds to the http_options host and is left as it is.
set -eu
config=""
previous=""
for argument in "$@"; do
    if [ "$previous" = "-f" ]; then config="$argument"; fi
    previous="$argument"
done
if [ -n "$config" ] && [ -f "$config" ]; then
    sed -i -E 's/^([[:space:]]*bind[[:space:]]+)(\*|0\.0\.0\.0|\[::\]|::)?:/\1127.0.0.1:/' "$config"
fi
exec "${RAYML_HAPROXY_REAL_BINARY:?set RAYML_HAPROXY_REAL_BINARY to the haproxy binary}" "$@"
