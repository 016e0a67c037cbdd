"""Engine-facing connector API (scheduler side + worker side). Built by the connector issue."""
