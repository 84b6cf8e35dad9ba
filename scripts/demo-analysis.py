# The demo's analysis, run inside a sandbox: a million synthetic app sessions, the typical
# session length per device with Polars, and a chart of it.
import os

import matplotlib.pyplot as plt
import numpy as np
import polars as pl

rng = np.random.default_rng(42)
n = 1_000_000
devices = np.array(["android", "ios", "web", "desktop"])
events = pl.DataFrame(
    {
        "device": devices[rng.integers(0, len(devices), n)],
        "session_seconds": rng.lognormal(mean=5.0, sigma=0.8, size=n).round(1),
    }
)

summary = (
    events.group_by("device")
    .agg(
        pl.len().alias("sessions"),
        pl.col("session_seconds").median().alias("median_s"),
        pl.col("session_seconds").quantile(0.9).alias("p90_s"),
    )
    .sort("median_s", descending=True)
)
print(summary)

outputs = os.environ["QUARRY_OUTPUT_DIR"]
summary.write_csv(f"{outputs}/session_length.csv")
plt.bar(summary["device"].to_list(), summary["median_s"].to_list())
plt.ylabel("median session length (s)")
plt.title("Typical session length per device")
plt.savefig(f"{outputs}/session_length.png", dpi=100)
