"""The payments app's refusal. A `BookingError`, so that the pages which already show booking's refusals (the
message, and the form field it belongs to) show a payment's the same way."""

from booking.rules import BookingError


class PaymentError(BookingError):
    """A payment rule said no; the message is translated and safe to show."""
