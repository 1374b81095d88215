"""Alerts: goodput drops and thresholds on stalls, stragglers and GPU faults, per cluster."""
