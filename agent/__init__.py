"""The machine agent: connects out to Astraeus, runs the workers placed on its machine, keeps
their logs on local disk, and reports their states."""
