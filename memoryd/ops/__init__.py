"""What SREs and analysts run memoryd with: health, cluster telemetry, maintenance, logs,
and the analyst commands `explain` and `replay verify`."""
