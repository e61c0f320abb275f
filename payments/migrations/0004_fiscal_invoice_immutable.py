"""An issued fiscal invoice never changes, and PostgreSQL says so: a trigger refuses any UPDATE but the one that
writes the PDF (and its hash and time) into a row without one, and the one that records the e-mail; and any DELETE.
`FiscalInvoice.save()` and `delete()` give the friendly refusal; this is the guarantee behind them, for code (or a
hand in psql) that skips the model. SQLite, the embedded development default, has the model's guard only.
"""

from django.db import migrations

CREATE = """
CREATE OR REPLACE FUNCTION payments_fiscal_invoice_immutable() RETURNS trigger AS $$
DECLARE
    written CONSTANT text[] := ARRAY['pdf', 'pdf_sha256', 'pdf_written_at', 'emailed_at'];
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'fiscal invoice % is issued and cannot be deleted', OLD.number;
    END IF;
    IF (to_jsonb(NEW) - written) IS DISTINCT FROM (to_jsonb(OLD) - written) THEN
        RAISE EXCEPTION 'fiscal invoice % is issued and cannot change', OLD.number;
    END IF;
    IF OLD.pdf_sha256 <> '' AND (NEW.pdf IS DISTINCT FROM OLD.pdf OR NEW.pdf_sha256 IS DISTINCT FROM OLD.pdf_sha256
                                 OR NEW.pdf_written_at IS DISTINCT FROM OLD.pdf_written_at) THEN
        RAISE EXCEPTION 'the PDF of fiscal invoice % is written and is never replaced', OLD.number;
    END IF;
    IF OLD.emailed_at IS NOT NULL AND NEW.emailed_at IS DISTINCT FROM OLD.emailed_at THEN
        RAISE EXCEPTION 'fiscal invoice % was e-mailed at %', OLD.number, OLD.emailed_at;
    END IF;
    RETURN NEW;
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER payments_fiscal_invoice_immutable
    BEFORE UPDATE OR DELETE ON payments_fiscalinvoice
    FOR EACH ROW EXECUTE FUNCTION payments_fiscal_invoice_immutable();
"""
DROP = """
DROP TRIGGER IF EXISTS payments_fiscal_invoice_immutable ON payments_fiscalinvoice;
DROP FUNCTION IF EXISTS payments_fiscal_invoice_immutable();
"""


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE, params=None)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP, params=None)


class Migration(migrations.Migration):
    dependencies = [("payments", "0003_fiscal_invoices")]

    operations = [migrations.RunPython(create, drop, elidable=False)]
