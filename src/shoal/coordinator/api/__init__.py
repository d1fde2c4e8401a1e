"""The coordinator's HTTP edge: routes per resource, signed-request checks, body limits
and metrics. Errors become 4xx with a JSON body here, and nowhere else."""
