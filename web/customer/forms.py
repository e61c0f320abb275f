"""Forms of the customer pages. They parse and give field-level messages; booking rules live in services."""

import re
from datetime import date

from django import forms
from django.core.exceptions import ValidationError
from django.core.validators import MaxLengthValidator, MaxValueValidator
from django.utils.translation import gettext_lazy as _

from booking import archcheck_report
from booking.billing import NOT_PRINTABLE_MESSAGE, printable
from booking.models import CHECKPOINT_INTERVAL_HOURS, AlertMails, EnvironmentImage, Hypothesis, Sharing, WindowDays
from booking.report_schema import InvalidReport
from booking.rules import BookingError, clean_checkpoint_dir
from booking.ssh_keys import InvalidSshKey, SshPublicKey, parse_authorized_keys
from inventory.models import HardwareClass

# Possessive quantifiers (`*+`): the two runs of spaces cannot trade characters, so a `<` followed by a long run of
# spaces and no letter is rejected in one pass (`<\s*[/!?]?\s*` split the run every possible way: quadratic).
_MARKUP = re.compile(r"<\s*+[/!?]?\s*+[a-zA-Z]")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_CONTROL_OR_NEWLINE = re.compile(r"[\x00-\x1f\x7f]")


def no_markup(value: str) -> None:
    if _MARKUP.search(value):
        raise ValidationError(_("HTML tags are not accepted here."), code="markup")
    if _CONTROL.search(value):
        raise ValidationError(_("Control characters are not accepted."), code="control")
    if not printable(value):  # what XML cannot hold would make the invoice (or an e-mail) unprintable
        raise ValidationError(NOT_PRINTABLE_MESSAGE, code="not_printable")


def single_line(value: str) -> None:
    no_markup(value)
    if _CONTROL_OR_NEWLINE.search(value):
        raise ValidationError(_("Write this on one line."), code="control")


class LengthFirst:
    """Refuses an over-long value in `to_python`, before any validator runs: Django runs every validator of a field
    even after `max_length` failed, so a pattern would otherwise scan the whole body."""

    def to_python(self, value):
        value = super().to_python(value)
        if self.max_length is not None and len(value) > self.max_length:
            MaxLengthValidator(self.max_length)(value)
        return value


class BoundedCharField(LengthFirst, forms.CharField):
    pass


class BoundedEmailField(LengthFirst, forms.EmailField):
    pass


class Catalog:
    """What the booking forms choose from, built from selectors.offered_classes() (environments prefetched):
    the offered environments are those that run on an offered class."""

    def __init__(self, *, classes: list[HardwareClass]) -> None:
        self.classes = classes
        self.class_by_slug = {hardware_class.slug: hardware_class for hardware_class in classes}
        self.environment_by_slug: dict[str, EnvironmentImage] = {}
        self.class_slugs_by_environment: dict[str, list[str]] = {}
        for hardware_class in classes:
            for environment in hardware_class.environments.all():
                self.environment_by_slug.setdefault(environment.slug, environment)
                self.class_slugs_by_environment.setdefault(environment.slug, []).append(hardware_class.slug)
        self.environments = sorted(self.environment_by_slug.values(), key=lambda e: (e.position, e.name))

    @property
    def default_class(self) -> HardwareClass | None:
        return next((c for c in self.classes if c.is_default), self.classes[0] if self.classes else None)

    def environments_for(self, hardware_class: HardwareClass) -> list[EnvironmentImage]:
        return list(hardware_class.environments.all())


class EnvironmentSelect(forms.Select):
    """A select whose options say which hardware classes they run on (portal.js greys out the others)."""

    classes_by_environment: dict[str, str] = {}

    def create_option(self, name, value, label, selected, index, subindex=None, attrs=None):
        option = super().create_option(name, value, label, selected, index, subindex=subindex, attrs=attrs)
        option["attrs"]["data-classes"] = self.classes_by_environment.get(str(value), "")
        return option


_QUOTE_INPUT = {"data-quote": ""}


class QuoteForm(forms.Form):
    """The choices that make a price: class, environment, lots, start date, window."""

    hardware_class = forms.ChoiceField(
        label=_("Hardware"),
        widget=forms.RadioSelect(attrs=_QUOTE_INPUT),
        error_messages={"invalid_choice": _("Choose one of the hardware classes on offer.")},
    )
    environment = forms.ChoiceField(
        label=_("Environment image"),
        widget=EnvironmentSelect(attrs=_QUOTE_INPUT),
        error_messages={"invalid_choice": _("Choose one of the environment images on offer.")},
    )
    lots = forms.IntegerField(
        label=_("Number of two-card lots"),
        min_value=1,
        widget=forms.NumberInput(attrs=_QUOTE_INPUT),
        error_messages={"invalid": _("Give the number of lots as a whole number, e.g. 2.")},
    )
    start_date = forms.DateField(
        label=_("Start date (00:00 UTC)"),
        required=False,
        widget=forms.DateInput(attrs={"type": "date", **_QUOTE_INPUT}, format="%Y-%m-%d"),
        input_formats=["%Y-%m-%d"],
        error_messages={"invalid": _("Give the start date as YYYY-MM-DD.")},
    )
    start_when_ready = forms.BooleanField(
        label=_("Start as soon as ready, within hours (the start date is then not used)"),
        required=False,
        widget=forms.CheckboxInput(attrs=_QUOTE_INPUT),
    )
    days = forms.TypedChoiceField(
        label=_("Research window"),
        choices=WindowDays.choices,
        coerce=int,
        widget=forms.RadioSelect(attrs=_QUOTE_INPUT),
        error_messages={"invalid_choice": _("Choose a window of 3, 7 or 30 days.")},
    )

    def __init__(self, *args, catalog: Catalog, max_lots: int, min_max: dict | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.catalog = catalog
        self.fields["hardware_class"].choices = [(c.slug, c.name) for c in catalog.classes]
        self.fields["environment"].choices = [(e.slug, e.name) for e in catalog.environments]
        self.fields["environment"].widget.classes_by_environment = {
            slug: " ".join(class_slugs) for slug, class_slugs in catalog.class_slugs_by_environment.items()
        }
        self.fields["start_date"].widget.attrs.update(min_max or {})
        self.fields["lots"].validators.append(
            MaxValueValidator(max_lots, message=_("At most %(limit_value)s lots can be booked in one order."))
        )
        self.fields["lots"].widget.attrs.update({"min": 1, "max": max_lots})

    def clean_hardware_class(self) -> HardwareClass:
        return self.catalog.class_by_slug[self.cleaned_data["hardware_class"]]

    def clean(self) -> dict:
        cleaned = super().clean()
        if (
            not cleaned.get("start_when_ready")
            and cleaned.get("start_date") is None
            and "start_date" not in self.errors
        ):
            self.add_error("start_date", _("Give the start date, or tick “start as soon as ready”."))
        return cleaned

    def clean_environment(self) -> EnvironmentImage:
        return self.catalog.environment_by_slug[self.cleaned_data["environment"]]


class CalendarForm(forms.Form):
    """The public calendar's choices (a GET form): a class, a window length, a number of lots. A value that is not
    one of them is replaced by the default: the calendar never refuses to draw."""

    hardware_class = forms.ChoiceField(label=_("Hardware"))
    days = forms.TypedChoiceField(label=_("Research window"), choices=WindowDays.choices, coerce=int)
    lots = forms.IntegerField(label=_("Number of two-card lots"), min_value=1)

    def __init__(self, data, *, catalog: Catalog, max_lots: int) -> None:
        default = catalog.default_class
        self.defaults = {"hardware_class": default.slug if default else "", "days": WindowDays.SEVEN, "lots": 1}
        super().__init__({**self.defaults, **{name: data.get(name) for name in self.base_fields if data.get(name)}})
        self.catalog = catalog
        self.fields["hardware_class"].choices = [(c.slug, c.name) for c in catalog.classes]
        self.fields["lots"].max_value = max_lots
        self.fields["lots"].widget.attrs.update({"min": 1, "max": max_lots})
        self.fields["lots"].validators.append(MaxValueValidator(max_lots))

    def choice(self) -> dict:
        """The valid choices, the defaults standing in for the others (the class as the catalog's instance)."""
        self.is_valid()
        chosen = {**self.defaults, **self.cleaned_data}
        chosen["days"] = int(chosen["days"])
        chosen["hardware_class"] = self.catalog.class_by_slug.get(chosen["hardware_class"])
        # the form shows what is drawn, not the value that was replaced
        self.data = {**self.data, **{name: self.defaults[name] for name in self.errors}}
        return chosen


class BillingFields(forms.Form):
    """Who the invoice is made out to (booking/billing.py checks them: country code, VAT number format)."""

    billing_address = BoundedCharField(
        label=_("Billing address"),
        max_length=500,
        validators=[no_markup],
        widget=forms.Textarea(attrs={"rows": 3, "autocomplete": "street-address"}),
        help_text=_("Street, postcode and city, as they must appear on the invoice."),
        error_messages={"required": _("Give the billing address: street, postcode and city.")},
    )
    billing_country = BoundedCharField(
        label=_("Country (ISO code)"),
        max_length=40,
        validators=[single_line],
        widget=forms.TextInput(attrs={"size": 3, "autocomplete": "country", "placeholder": "FR"}),
        help_text=_("Two letters, e.g. FR, DE, US."),
        error_messages={"required": _("Give the country as its two-letter ISO code, e.g. FR, DE or US.")},
    )
    vat_number = BoundedCharField(
        label=_("VAT number (optional)"),
        max_length=40,
        required=False,
        validators=[single_line],
        widget=forms.TextInput(attrs={"autocomplete": "off", "spellcheck": "false"}),
        help_text=_("An EU business with a VAT number of another EU country is invoiced under reverse charge."),
    )
    purchase_order = BoundedCharField(
        label=_("Purchase-order reference (optional)"),
        max_length=64,
        required=False,
        validators=[single_line],
        help_text=_("Printed on the invoice, if your lab's purchasing needs it."),
    )


class BillingForm(BillingFields):
    """The billing details, changed from the order page until the invoice is issued."""

    organisation = BoundedCharField(label=_("Organisation"), max_length=200, validators=[single_line])

    field_order = ["organisation", "billing_address", "billing_country", "vat_number", "purchase_order"]


class BookingForm(QuoteForm, BillingFields):
    contact_name = BoundedCharField(label=_("Your name"), max_length=120, validators=[single_line])
    contact_email = BoundedEmailField(label=_("E-mail"), max_length=254)
    organisation = BoundedCharField(
        label=_("Organisation"), max_length=200, validators=[single_line], help_text=_("Lab, company or university.")
    )
    messenger = BoundedCharField(
        label=_("Messenger handle (optional)"),
        max_length=100,
        required=False,
        validators=[single_line],
        help_text=_("Signal, Matrix, Telegram… if you prefer it to e-mail for urgent matters."),
    )
    ssh_keys = BoundedCharField(
        label=_("SSH public keys"),
        max_length=20000,
        widget=forms.Textarea(attrs={"rows": 3, "spellcheck": "false", "autocomplete": "off"}),
        help_text=_(
            "One key per line, as in ~/.ssh/id_ed25519.pub. Accepted: ed25519, ECDSA, RSA of 3072 bits or more."
        ),
    )
    sharing = forms.ChoiceField(
        label=_("What will the two cards share?"),
        choices=Sharing.choices,
        widget=forms.RadioSelect,
        error_messages={"invalid_choice": _("Choose what the two cards will share.")},
        help_text=_("Two cards are two separate memories: 360 GB added up is never one allocation."),
    )
    hypothesis = forms.ChoiceField(
        label=_("What should two cards bring to your research?"),
        choices=Hypothesis.choices,
        widget=forms.RadioSelect,
        error_messages={"invalid_choice": _("Choose one of the hypotheses listed.")},
    )
    hypothesis_detail = BoundedCharField(
        label=_("Your hypothesis, in your words"),
        max_length=2000,
        validators=[no_markup],
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text=_("One sentence, e.g. “A global batch of 2048 instead of 1024 reaches the target loss sooner.”"),
        error_messages={"required": _("Describe your hypothesis in a few words.")},
    )
    hypothesis_measure = BoundedCharField(
        label=_("The measure that would confirm it"),
        max_length=1000,
        validators=[no_markup],
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text=_("e.g. “time per step after warm-up, 1.6× shorter on two cards at the same global batch”."),
        error_messages={"required": _("Say which measure would confirm your hypothesis.")},
    )
    checkpoint_interval_hours = forms.IntegerField(
        label=_("Checkpoint every (hours)"),
        required=False,
        min_value=CHECKPOINT_INTERVAL_HOURS[0],
        max_value=CHECKPOINT_INTERVAL_HOURS[1],
        widget=forms.NumberInput(attrs={"min": CHECKPOINT_INTERVAL_HOURS[0], "max": CHECKPOINT_INTERVAL_HOURS[1]}),
        error_messages={"invalid": _("Give the checkpoint interval as a whole number of hours, e.g. 6.")},
    )
    checkpoint_dir = BoundedCharField(
        label=_("Checkpoint directory (optional)"),
        max_length=200,
        required=False,
        help_text=_(
            "In your home, e.g. ~/runs/ckpt: we then say so when no file there is newer than twice the interval "
            "(only the newest file's time is read, never a file)."
        ),
    )
    stop_criteria = BoundedCharField(
        label=_("Stop criteria"),
        max_length=2000,
        required=False,
        validators=[no_markup],
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text=_("When would you end the campaign early, e.g. “validation loss flat for 3 days”."),
    )
    notes = BoundedCharField(
        label=_("Notes for the operators (optional)"),
        max_length=4000,
        required=False,
        validators=[no_markup],
        widget=forms.Textarea(attrs={"rows": 2}),
    )
    # The terms version the page showed: the booking service refuses it once a newer one is published.
    terms_version = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=2**31 - 1,
        widget=forms.HiddenInput,
        error_messages={"invalid": _("Read and accept the terms of sale to book.")},
    )
    accept_terms = forms.BooleanField(
        label=_("I have read and accept the terms of sale and the cancellation and refund policy"),
        error_messages={"required": _("Read and accept the terms of sale to book.")},
    )

    # Booking again with the data of an earlier order: its number and the token of its link (the proof the customer
    # holds it), carried by the page opened from that link; the box lets them book without it after all.
    carry_from = BoundedCharField(required=False, max_length=16, widget=forms.HiddenInput)
    carry_token = BoundedCharField(required=False, max_length=128, widget=forms.HiddenInput)
    carry_data = forms.BooleanField(
        label=_("Carry my data: the files of my earlier order are in my home directory on the same machine"),
        required=False,
    )
    archcheck_report = forms.FileField(
        label=_("Your archcheck report (optional)"),
        required=False,
        help_text=_(
            "report.json written by archcheck.py on your machine: the page says which cards run your compiled "
            "extensions, and your order keeps it."
        ),
        widget=forms.ClearableFileInput(attrs={"accept": ".json,application/json"}),
    )

    def clean_archcheck_report(self) -> dict | None:
        upload = self.cleaned_data.get("archcheck_report")
        return archcheck_from_upload(upload) if upload else None

    def clean_ssh_keys(self) -> list[SshPublicKey]:
        try:
            return parse_authorized_keys(self.cleaned_data["ssh_keys"])
        except InvalidSshKey as exc:
            raise ValidationError(str(exc), code="ssh_key") from exc

    def clean_checkpoint_dir(self) -> str:
        return checkpoint_dir_or_error(self.cleaned_data["checkpoint_dir"])

    def clean(self) -> dict:
        cleaned = super().clean()
        for name, message in (
            ("hypothesis_detail", _("Describe your hypothesis in a few words.")),
            ("hypothesis_measure", _("Say which measure would confirm your hypothesis.")),
        ):
            if name in cleaned and not cleaned[name].strip():
                self.add_error(name, message)
        if cleaned.get("days") == WindowDays.THIRTY:
            if cleaned.get("checkpoint_interval_hours") is None and "checkpoint_interval_hours" not in self.errors:
                self.add_error(
                    "checkpoint_interval_hours", _("A 30-day campaign checkpoints regularly: give the interval.")
                )
            if not cleaned.get("stop_criteria", "").strip() and "stop_criteria" not in self.errors:
                self.add_error(
                    "stop_criteria", _("A 30-day campaign needs its stop criteria: say when you would stop it early.")
                )
        return cleaned


def _archcheck_messages() -> dict:
    return {
        "too_large": _("This report is too large: an archcheck report is at most 100 kB of JSON."),
        "not_json": _("This file is not a JSON report written by archcheck.py."),
        "too_deep": _("This JSON is nested too deeply to be an archcheck report."),
        "wrong_schema": _("This is not a report of archcheck.py (its schema is unknown)."),
    }


ARCHCHECK_MESSAGES = _archcheck_messages()


def archcheck_from_upload(upload) -> dict:
    """The validated archcheck report of an uploaded file (booking/archcheck_report.py), or a ValidationError that
    says why in the reader's language."""
    if upload.size > archcheck_report.MAX_BYTES:
        raise ValidationError(ARCHCHECK_MESSAGES["too_large"], code="too_large")
    try:
        return archcheck_report.parse_report(upload.read(archcheck_report.MAX_BYTES + 1))
    except InvalidReport as exc:
        message = ARCHCHECK_MESSAGES.get(
            exc.code, _("This report has a field archcheck.py does not write so: make it again with the tool.")
        )
        raise ValidationError(message, code=exc.code) from exc


class KeysAddForm(forms.Form):
    """Keys added to an order during its life: the same rules as at booking."""

    ssh_keys = BoundedCharField(
        label=_("Add SSH public keys"),
        max_length=20000,
        widget=forms.Textarea(attrs={"rows": 2, "spellcheck": "false", "autocomplete": "off"}),
        help_text=_("One key per line, as in ~/.ssh/id_ed25519.pub."),
    )

    def clean_ssh_keys(self) -> list[SshPublicKey]:
        try:
            return parse_authorized_keys(self.cleaned_data["ssh_keys"])
        except InvalidSshKey as exc:
            raise ValidationError(str(exc), code="ssh_key") from exc


class AlertMailsForm(forms.Form):
    alert_mails = forms.ChoiceField(
        label=_("E-mail me when my cards look unbalanced or idle"), choices=AlertMails.choices, widget=forms.RadioSelect
    )


def checkpoint_dir_or_error(value: str) -> str:
    try:
        return clean_checkpoint_dir(value)
    except BookingError as exc:
        raise ValidationError(exc.message, code="checkpoint_dir") from exc


class CheckpointWatchForm(forms.Form):
    """The order page's checkpoint watch: a directory of the home and the interval (empty directory: no watch)."""

    checkpoint_dir = BoundedCharField(label=_("Checkpoint directory"), max_length=200, required=False)
    checkpoint_interval_hours = forms.IntegerField(
        label=_("Checkpoint every (hours)"),
        min_value=CHECKPOINT_INTERVAL_HOURS[0],
        max_value=CHECKPOINT_INTERVAL_HOURS[1],
        error_messages={"invalid": _("Give the checkpoint interval as a whole number of hours, e.g. 6.")},
    )

    def clean_checkpoint_dir(self) -> str:
        return checkpoint_dir_or_error(self.cleaned_data["checkpoint_dir"])


class ResendLinkForm(forms.Form):
    email = BoundedEmailField(label=_("E-mail used for the booking"), max_length=254)


class ConfirmAddressForm(forms.Form):
    """The booking form's contact address, posted by its "e-mail me a confirmation link" button."""

    contact_email = BoundedEmailField(label=_("E-mail"), max_length=254)


def quote_initial(*, catalog: Catalog, earliest: date) -> dict:
    hardware_class = catalog.default_class
    environments = catalog.environments_for(hardware_class) if hardware_class else []
    return {
        "hardware_class": hardware_class.slug if hardware_class else "",
        "environment": environments[0].slug if environments else "",
        "lots": 1,
        "start_date": earliest,
        "start_when_ready": False,
        "days": WindowDays.SEVEN,
    }


def _fit_number(label, *, whole: bool = False, step: str = "any", **bounds) -> forms.Field:
    """An optional number of the advisor (it updates live: `data-fit`); a whole one for shapes, counts and sizes."""
    if whole:
        return forms.IntegerField(
            label=label,
            required=False,
            min_value=1,
            max_value=10**7,
            widget=forms.NumberInput(attrs={"data-fit": ""}),
        )
    return forms.FloatField(
        label=label, required=False, widget=forms.NumberInput(attrs={"step": step, "data-fit": ""}), **bounds
    )


def _fit_choice(label, choices: list, initial: str, *, widget=forms.Select) -> forms.ChoiceField:
    return forms.ChoiceField(label=label, choices=choices, widget=widget(attrs={"data-fit": ""}), initial=initial)


class FitForm(forms.Form):
    """The memory-fit advisor's inputs (booking/fit.py). Prefixed "fit" on the booking page."""

    parameters_billion = forms.FloatField(
        label=_("Parameters (billions)"),
        min_value=0.001,
        max_value=10000,
        widget=forms.NumberInput(attrs={"step": "any", "data-fit": ""}),
        error_messages={"invalid": _("Give the model size in billions of parameters, e.g. 7 or 0.35.")},
    )
    mode = _fit_choice(
        _("Use"), [("training", _("Training")), ("inference", _("Inference"))], "training", widget=forms.RadioSelect
    )
    weight_precision = _fit_choice(_("Weights in"), [("bf16", "bf16"), ("fp32", "fp32"), ("fp8", "fp8")], "bf16")
    optimizer = _fit_choice(
        _("Optimizer"),
        [
            ("adamw", "AdamW"),
            ("sgd_momentum", _("SGD with momentum")),
            ("adafactor", _("Adafactor-like")),
            ("none", _("None")),
        ],
        "adamw",
    )
    optimizer_precision = _fit_choice(
        _("Optimizer state in"), [("fp32", "fp32"), ("bf16", "bf16"), ("fp8", "fp8")], "fp32"
    )
    rocm_ready = forms.BooleanField(
        label=_("My project already runs on ROCm (AMD)"),
        required=False,
        widget=forms.CheckboxInput(attrs={"data-fit": ""}),
        help_text=_("Only then is the MI300X suggested: moving a CUDA project to ROCm is a project of its own."),
    )
    activations_gb = _fit_number(_("Activations per card (GB), if measured"), min_value=0, max_value=100000)
    batch = _fit_number(_("Batch per card"), whole=True)
    sequence = _fit_number(_("Sequence length"), whole=True)
    hidden = _fit_number(_("Hidden size"), whole=True)
    layers = _fit_number(_("Layers"), whole=True)
    checkpointing_factor = _fit_number(
        _("Activations kept (1 = no checkpointing)"), step="0.05", min_value=0.01, max_value=1, initial=1.0
    )
    kv_cache_gb = _fit_number(_("KV cache (GB), inference"), min_value=0, max_value=100000)
    reserve_percent = _fit_number(_("Runtime reserve (%)"), step="1", min_value=0, max_value=50, initial=10)

    def clean(self) -> dict:
        cleaned = super().clean()
        shape = [cleaned.get(name) for name in ("batch", "sequence", "hidden", "layers")]
        if any(value is not None for value in shape) and not all(value is not None for value in shape):
            raise ValidationError(_("Give all four of batch, sequence, hidden size and layers, or none of them."))
        return cleaned

    def fit_input(self):
        from booking import fit

        data = self.cleaned_data
        reserve = data.get("reserve_percent")
        checkpointing = data.get("checkpointing_factor")
        try:
            return fit.FitInput(
                parameters_billion=data["parameters_billion"],
                mode=data["mode"],
                weight_precision=data["weight_precision"],
                optimizer_precision=data["optimizer_precision"],
                optimizer=data["optimizer"],
                activations_gb=data.get("activations_gb"),
                batch=data.get("batch"),
                sequence=data.get("sequence"),
                hidden=data.get("hidden"),
                layers=data.get("layers"),
                checkpointing_factor=1.0 if checkpointing is None else checkpointing,
                kv_cache_gb=data.get("kv_cache_gb"),
                reserve_fraction=0.10 if reserve is None else reserve / 100,
            )
        except ValueError as exc:  # the formulas' own bounds, past the form's
            self.add_error(None, str(exc))
            return None

    def stored_inputs(self) -> dict:
        return {name: value for name, value in self.cleaned_data.items() if value not in (None, "", False)}
