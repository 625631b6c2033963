"""Reading runs: paired statistics, held-out evidence, charts, compare, summary tables, export."""
