"""The gateway: Teto's HTTP API. It owns nothing durable but API tokens; it reads other services' public views
and turns requests into commands on the command stream."""
