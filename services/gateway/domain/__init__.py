"""Pure rules of the gateway: how a job is shown and how a command's outcome maps to an HTTP answer."""
