# The demo's analysis, run inside a sandbox on the two files quarry exported into its data_dir:
# the seed's reference cases on the demo data. Polars for the small one (median and P90 of
# peak views per category), DuckDB for the events (typical session length per device), and a
# chart of each.
import os

import duckdb
import matplotlib.pyplot as plt
import polars as pl

data = os.environ["QUARRY_DATA_DIR"]
outputs = os.environ["QUARRY_OUTPUT_DIR"]

peaks = pl.read_parquet(f"{data}/peak_views.parquet")
by_category = (
    peaks.group_by("category_name")
    .agg(
        pl.len().alias("videos"),
        pl.col("peak_views").median().alias("median_peak_views"),
        pl.col("peak_views").quantile(0.9).alias("p90_peak_views"),
    )
    .sort("median_peak_views", descending=True)
)
print(by_category)

sessions = duckdb.sql(
    f"""
    SELECT device, count(DISTINCT session_id) AS sessions,
           median(session_length_seconds) AS median_s,
           quantile_cont(session_length_seconds, 0.9) AS p90_s
    FROM '{data}/events.parquet'
    GROUP BY device ORDER BY median_s DESC
    """
).pl()
print(sessions)

by_category.write_csv(f"{outputs}/peak_views_by_category.csv")
figure, (left, right) = plt.subplots(1, 2, figsize=(13, 5))
left.barh(by_category["category_name"].to_list(), by_category["median_peak_views"].to_list())
left.set_xlabel("median peak views")
left.set_title("Peak views per video, by category")
right.bar(sessions["device"].to_list(), sessions["median_s"].to_list())
right.set_ylabel("median session length (s)")
right.set_title("Typical session length per device")
figure.tight_layout()
figure.savefig(f"{outputs}/analysis.png", dpi=100)
