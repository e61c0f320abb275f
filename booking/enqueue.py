"""How booking's services hand work to a worker: by the task's name, so that the services never import the tasks
that call them (booking/tasks.py imports the services; the app registers its tasks when ready, booking/apps.py).
Each function queues after the current transaction commits, as the conventions ask."""

from infrastructure.queues import after_commit


def send_order_link(order_id: int) -> None:
    after_commit("booking.send_order_link", order_id)


def send_order_links(email: str, language: str) -> None:
    after_commit("booking.send_order_links", email, language)


def send_address_confirmation(email: str, language: str) -> None:
    after_commit("booking.send_address_confirmation", email, language)


def send_order_cancelled(order_id: int) -> None:
    after_commit("booking.send_order_cancelled", order_id)
