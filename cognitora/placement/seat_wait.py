"""The wait for a seat: on an engine whose batch slots are all taken, a new request starts only when enough of the
running ones have finished (docs/placement.md, "Seats").

    occupied(e)  = max(router in-flight requests(e), running(e) + waiting(e))
    ahead(e)     = occupied(e) - seats(e)              requests queued for a seat before this one
    seat_wait(e) = 0                                    while ahead(e) < 0: a seat is free
                 = departure_wait(ahead(e) + 1)         otherwise

``seats(e)`` is the endpoint's ``max_num_seqs`` (its ``cost`` setting, llama.cpp's ``/slots``, or learned,
``kvstate.seats``). The router's in-flight count sees what the engine cannot show yet (requests sent since the
last scrape, or held in a gateway's connection pool); the engine's gauges see what bypassed the routers.

**Departures.** ``S`` (``mean_service_s``) is how long a request holds a seat there, in the engine's clock. Little's
law alone puts the k-th departure of ``n`` seat holders at ``k x S / n``: right when their ages are spread evenly,
wrong for a cohort that took its seats together (a burst, a ramp of load): they leave together, ``S`` after they
came, and until then nobody does. A cohort is what fills an engine: on the 32 x 32 shared-prefix ladder the seats
filled 6.5 s into the run, all taken within those 6.5 s, with 15.4 s of service each; the first seat freed 9 s later,
where Little's law said 0.06 s.

This gateway knows its own seat holders and how long its requests hold a seat there on its own clock
(``SeatProgress``), so each one's *used share* ``u = age / tenure`` is free of clock units. Its residual service is
``(1 - u)+ x S``, and the k-th departure of the engine's ``n`` seat holders is read off the residuals' ``k / n``
quantile (the gateway's requests stand for all of them: other replicas' traffic is alike), plus ``S`` for each full
round of ``n``:

    deterministic(k) = floor((k - 1) / n) x S + quantile((1 - u_i)+, ((k - 1) mod n + 1) / n) x S

That is exact when every request takes ``S``. When service times vary, an old request can outlive the mean and a
young one leave early; with exponential ones (squared coefficient of variation ``c2 = 1``) ages say nothing,
departures are Poisson and Little's law is exact. So the two are blended by the tenure's measured ``c2``:

    departure_wait(k) = (1 - c2) x deterministic(k) + c2 x k x S / n

Before the gateway has measured a tenure (no request finished there yet, which on a ramp of load is exactly when
the seats fill), the ages are read on the engine's clock against ``S``: ``u = age x clock_rate / S``, with
``clock_rate`` the engine seconds per gateway second the scraper learned (``EndpointSnapshot.clock_rate``: 1 on a
real engine, 0.1 for the simulator at time scale 0.1), and ``c2`` a prior (``seat_tenure.PRIOR_VARIABILITY``).
Without seat holders of this gateway's there, it is Little's law alone. Pure functions of their arguments.
"""

from __future__ import annotations

import math

from cognitora.placement.state import SeatProgress
from kvstate.store import EndpointSnapshot, InFlight

__all__ = ["departure_wait_s", "engine_clock_rate", "seat_wait_s"]


def departure_wait_s(
    departures: int, holders: int, service_s: float, progress: SeatProgress | None, clock_rate: float = 1.0
) -> float:
    """Seconds until ``departures`` of an engine's ``holders`` seat holders have left (``service_s`` each, on
    average, on the engine's clock), from their ages when ``progress`` has any: as shares of the tenure the gateway
    measured, or before it has, on the engine's clock (``clock_rate`` engine seconds per gateway second)."""
    n = max(holders, 1)
    little = departures * service_s / n
    if progress is None or not progress.ages_s or service_s <= 0:
        return little
    if progress.tenure_s is not None and progress.tenure_s > 0:
        tenure, scale = progress.tenure_s, 1.0
    else:
        tenure, scale = service_s, clock_rate
    rounds, rest = divmod(departures - 1, n)
    residuals = sorted(max(0.0, 1.0 - age * scale / tenure) for age in progress.ages_s)
    index = min(len(residuals) - 1, max(0, math.ceil((rest + 1) / n * len(residuals)) - 1))
    deterministic = (rounds + residuals[index]) * service_s
    c2 = min(1.0, max(0.0, progress.variability))
    return (1.0 - c2) * deterministic + c2 * little


def engine_clock_rate(snap: EndpointSnapshot | None) -> float:
    """Engine seconds per gateway second: the rate the engine declares (the time-scaled simulator,
    ``kvstate.engines.declared_clock``), else 1. A real engine's clock is the gateway's. The scraper's learned
    ``clock_rate`` is not used: it reads every running request as decoding, so a real engine under prefill-heavy
    load measured 0.4-0.6 as often as 1, and flow control, which converts its waits with this rate, would have held
    requests twice their objective's bound there."""
    if snap is not None and snap.clock_declared and snap.clock_rate is not None and snap.clock_rate > 0:
        return snap.clock_rate
    return 1.0


def seat_wait_s(
    seats: int | None,
    flight: InFlight,
    snap: EndpointSnapshot | None,
    service_s: float,
    progress: SeatProgress | None,
) -> float:
    """Seconds a request sent now waits for a seat (0 while one is free, or the seats or the service time are
    unknown). ``snap``: the endpoint's fresh snapshot, or None."""
    if not seats or service_s <= 0:
        return 0.0
    occupied = flight.requests
    if snap is not None:
        occupied = max(occupied, snap.running + snap.waiting)
    ahead = occupied - seats
    if ahead < 0:
        return 0.0
    return departure_wait_s(ahead + 1, seats, service_s, progress, engine_clock_rate(snap))
