"""The live quote of the booking page: availability of every class for the chosen window, price, and what
would stop the booking, explained before the researcher submits. Reads only."""

from dataclasses import dataclass, field
from datetime import date, datetime
from decimal import Decimal

from django.utils import timezone
from django.utils.translation import gettext as _

from booking import selectors
from booking.models import BookingPolicy, EnvironmentImage
from booking.rules import BookingError, capacity_problem, check_environment, check_window
from inventory.models import HardwareClass


@dataclass
class ClassOffer:
    hardware_class: HardwareClass
    availability: selectors.Availability
    price_per_lot: Decimal | None


@dataclass
class Quote:
    hardware_class: HardwareClass
    environment: EnvironmentImage | None
    lot_count: int
    days: int
    window: selectors.Window
    offers: list[ClassOffer]
    price_per_lot: Decimal | None = None
    total: Decimal | None = None
    problems: list[str] = field(default_factory=list)
    next_dates: list[date] = field(default_factory=list)
    # The window starts as soon as ready (its days count from the hand-over); `ready_start` is the earliest such
    # start of the chosen class, shown whichever start was chosen (None: no lots free that soon, or not offered).
    start_when_ready: bool = False
    ready_start: datetime | None = None

    @property
    def bookable(self) -> bool:
        return not self.problems and self.total is not None

    @property
    def chosen_offer(self) -> ClassOffer | None:
        return next((o for o in self.offers if o.hardware_class.pk == self.hardware_class.pk), None)


def build_quote(
    *,
    classes: list[HardwareClass],
    hardware_class: HardwareClass,
    environment: EnvironmentImage | None,
    lot_count: int,
    start_date: date,
    days: int,
    policy: BookingPolicy,
    now: datetime | None = None,
    start_when_ready: bool = False,
) -> Quote:
    """`classes` come from selectors.offered_classes() (prices and environments prefetched)."""
    now = now or timezone.now()
    problems = []
    try:
        check_window(
            start_date=start_date, days=days, lot_count=lot_count, policy=policy, now=now, when_ready=start_when_ready
        )
    except BookingError as exc:
        problems.append(exc.message)
    ready = selectors.ready_start(
        hardware_class=hardware_class, days=days, lot_count=max(1, lot_count), policy=policy, now=now
    )
    # A date outside the bookable range is explained above; availability is shown for the nearest bookable one.
    bookable_start = min(
        max(start_date, selectors.earliest_start_date(policy=policy, now=now)),
        selectors.latest_start_date(policy=policy, now=now),
    )
    if start_when_ready and ready is not None:
        window = ready.window
    elif start_when_ready:  # nothing free that soon: the next hour shows what is taken
        window = selectors.ready_window(starts_at=selectors.next_full_hour(now), days=days, policy=policy)
    else:
        window = selectors.window_for(start_date=bookable_start, days=days, policy=policy)
    availability = selectors.availability_for_window(window=window)
    offers = [
        ClassOffer(
            hardware_class=offered,
            availability=availability.get(offered.pk, selectors.Availability(free=0, total=0)),
            price_per_lot=selectors.price_for(hardware_class=offered, days=days),
        )
        for offered in classes
    ]
    quote = Quote(
        hardware_class=hardware_class,
        environment=environment,
        lot_count=lot_count,
        days=days,
        window=window,
        offers=offers,
        problems=problems,
        start_when_ready=start_when_ready,
        ready_start=ready.window.starts_at if ready else None,
    )
    if environment is not None:
        try:
            check_environment(hardware_class=hardware_class, environment=environment)
        except BookingError as exc:
            quote.problems.append(exc.message)
    chosen = quote.chosen_offer
    quote.price_per_lot = chosen.price_per_lot if chosen else None
    if quote.price_per_lot is None:
        quote.problems.append(_("This window is not on sale for this hardware class."))
    else:
        quote.total = quote.price_per_lot * lot_count
    capacity = chosen and capacity_problem(
        hardware_class=hardware_class,
        lot_count=lot_count,
        free=chosen.availability.free,
        total=chosen.availability.total,
    )
    if start_when_ready and ready is None and not capacity and not quote.problems:
        # free lots exist, on hosts that cannot be ready today
        capacity = _("No lots of %(hardware)s can be ready within hours: choose a start date.") % {
            "hardware": hardware_class.name
        }
    if capacity and not quote.problems:
        quote.problems.append(capacity)
        if chosen.availability.total >= lot_count:
            quote.next_dates = selectors.next_start_dates(
                hardware_class=hardware_class,
                lot_count=lot_count,
                days=days,
                after=now.date() if start_when_ready else start_date,
                policy=policy,
                now=now,
            )
    return quote
