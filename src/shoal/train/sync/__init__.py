"""How a step's contributions become one update on every replica: every step,
DiLoCo, DiLoCo with bounded staleness, robust aggregation and compression codecs."""
