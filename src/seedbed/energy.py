"""Energy and carbon of a training run, measured with CodeCarbon's offline tracker.

``EnergyMeter(country).start()`` when the run starts, ``stop()`` when it ends, in that order, once:
``stop()`` returns the energy the whole machine used meanwhile (kWh) and its emissions (kg CO2e)
at the carbon intensity of ``country``'s grid. The meter never fails a run: if CodeCarbon cannot
start or measure, it logs one warning and the figures are None. Nothing is written to disk and
nothing goes over the network.

CodeCarbon takes a while to start (it detects the hardware), which a user would wait for before
the first frame: ``start()`` returns at once and CodeCarbon starts on a thread meanwhile, so the
figures leave out the run's first moments; ``stop()`` says how long (``unmeasured_s``).
"""

from __future__ import annotations

import logging
import tempfile
import threading
import time
from typing import Any

log = logging.getLogger(__name__)

# CodeCarbon's CPU modes that read a power counter; its other modes (cpu_load, constant) assume
# a power from the CPU model's TDP, or from a constant when the model is not in its table.
_MEASURED_CPU_MODES = {
    "intel_rapl": "RAPL",
    "intel_power_gadget": "Intel Power Gadget",
    "windows_emi": "Windows EMI",
}
_CAVEAT = (
    "no power sensor readable, CodeCarbon assumed CPU power from the CPU model's TDP and load, "
    "and RAM power from its size; figures are rough"
)


class EnergyMeter:
    """Measures one session of a run: ``start()``, then ``stop() -> dict``; see the module doc."""

    def __init__(self, country: str, enabled: bool = True) -> None:
        self.country = country.upper()
        self.enabled = enabled
        self._tracker: Any = None
        self._scratch: tempfile.TemporaryDirectory | None = None
        self._starting: threading.Thread | None = None
        self._asked_at = self._measuring_at = 0.0

    def start(self) -> None:
        """Start measuring, on a thread: CodeCarbon takes a while to start."""
        if not self.enabled:
            return
        self._asked_at = time.monotonic()
        self._starting = threading.Thread(target=self._start, name="energy-meter", daemon=True)
        self._starting.start()

    def _start(self) -> None:
        try:
            import codecarbon
            from codecarbon.input import DataSource

            logging.getLogger("codecarbon").setLevel(logging.ERROR)  # it is chatty at INFO
            if self.country not in DataSource().get_global_energy_mix_data():
                log.warning("CodeCarbon has no grid data for %s: no emissions", self.country)
            # Powermetrics and Power Gadget write logs into output_dir: keep them out of sight.
            self._scratch = tempfile.TemporaryDirectory(prefix="seedbed-energy-")
            self._tracker = codecarbon.OfflineEmissionsTracker(
                country_iso_code=self.country,
                output_methods=[],  # no emissions.csv, no API, no Prometheus
                emissions_endpoint=None,
                output_dir=self._scratch.name,
                tracking_mode="machine",  # actors are other processes: count the whole machine
                allow_multiple_runs=True,  # no lock file
                log_level="error",
            )
            self._tracker.start()
            self._measuring_at = time.monotonic()
        except Exception as e:  # energy figures must never break a run
            log.warning("CodeCarbon could not start; no energy figures this run: %s", e)
            self._close()

    def stop(self) -> dict[str, Any] | None:
        """Stop measuring; the figures, None fields if measuring failed, or None if disabled."""
        if not self.enabled:
            return None
        if self._starting is not None:
            self._starting.join()
        result: dict[str, Any] = {
            "energy_kwh": None,
            "emissions_kg_co2e": None,
            "country": self.country,
            "power": "estimated",
            "method": "none",
            "caveat": "CodeCarbon could not measure this run",
            "unmeasured_s": None,  # the session's first seconds, while CodeCarbon started
        }
        if self._tracker is None:
            return result
        try:
            self._tracker.stop()
            data = self._tracker.final_emissions_data  # absent if CodeCarbon failed inside
            measured, method = _power_source(self._tracker)
            result.update(
                energy_kwh=float(data.energy_consumed),
                emissions_kg_co2e=float(data.emissions) if data.country_name else None,
                power="measured" if measured else "estimated",
                method=method,
                caveat=None if measured else _CAVEAT,
                unmeasured_s=round(self._measuring_at - self._asked_at, 2),
            )
        except Exception as e:
            log.warning("CodeCarbon could not measure this run: %s", e)
        finally:
            self._close()
        return result

    def _close(self) -> None:
        self._tracker = None
        if self._scratch is not None:
            self._scratch.cleanup()
            self._scratch = None


def _power_source(tracker: Any) -> tuple[bool, str]:
    """Whether CodeCarbon read power sensors for the CPU (and GPUs), and how, e.g. "CPU: RAPL".

    CodeCarbon has no public attribute for this; its hardware list is read defensively and
    anything unrecognised counts as estimated.
    """
    cpu = gpu = None
    cpu_measured = False
    for part in getattr(tracker, "_hardware", None) or []:
        kind = type(part).__name__
        if kind == "CPU":
            mode = str(getattr(part, "_mode", "unknown"))
            cpu_measured = mode in _MEASURED_CPU_MODES
            cpu = _MEASURED_CPU_MODES.get(mode, {"cpu_load": "TDP x load"}.get(mode, mode))
        elif kind in ("AppleSiliconChip", "Raspberry") and getattr(part, "chip_part", "") == "CPU":
            cpu, cpu_measured = ("powermetrics" if kind == "AppleSiliconChip" else "PMIC"), True
        elif kind == "GPU":
            gpu = "NVML/AMD SMI"  # both read the GPUs' own power counters
    parts = [f"CPU: {cpu or 'unknown'}", *([f"GPU: {gpu}"] if gpu else []), "RAM: size model"]
    return cpu_measured, "; ".join(parts)
