"""Idle policies (issue 41): a run whose GPUs all stay under a utilization for a window is
stopped, or its workspace told; what each policy did, and the GPU-hours its stops gave back."""
