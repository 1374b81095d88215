"""The REST compatibility shim: every curl line of the seeds, thin routes over the services."""
