"""Astraeus: runs GPU jobs and accounts for every GPU-hour they hold."""
