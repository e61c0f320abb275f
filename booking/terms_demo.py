"""The first terms version a fresh database starts with: demo text, marked as such, that an operator replaces by
publishing a new version in the admin. Plain constants (the data migration and the demo seed both read them)."""

_DEMO_EN = (
    "DEMO TEXT - this is a placeholder written for the demonstration of the portal, not binding terms. "
    "The operator replaces it by publishing a new version in the admin.\n\n"
)
_DEMO_FR = (
    "TEXTE DE DÉMONSTRATION - ce texte tient lieu de modèle pour la démonstration du portail ; il n'a aucune valeur "
    "contractuelle. L'opérateur le remplace en publiant une nouvelle version dans l'administration.\n\n"
)

FIRST_VERSION = {
    "terms_en": _DEMO_EN
    + "Binôme rents lots of data-centre GPUs for a window of 3, 7 or 30 days, paid in advance by a crypto "
    "transfer. The order is placed when the transfer is confirmed on chain and the operator approves it. Access is "
    "given over SSH for the window booked and revoked at its end; data left on the machine after the end is "
    "deleted.",
    "terms_fr": _DEMO_FR
    + "Binôme loue des lots de GPU de centre de données pour une fenêtre de 3, 7 ou 30 jours, payée d'avance par un "
    "virement en cryptomonnaie. La commande est ferme une fois le virement confirmé sur la chaîne et la commande "
    "approuvée par l'opérateur. L'accès est donné par SSH pour la fenêtre réservée et retiré à sa fin ; les données "
    "laissées sur la machine après la fin sont effacées.",
    "cancellation_en": _DEMO_EN
    + "An order can be cancelled free of charge until it is paid. A paid order that the operator rejects is "
    "refunded in full. A paid order cancelled by the customer is refunded by the rules below; the refund is paid "
    "in the asset and on the network of the payment.",
    "cancellation_fr": _DEMO_FR
    + "Une commande peut être annulée sans frais tant qu'elle n'est pas payée. Une commande payée que l'opérateur "
    "refuse est remboursée en totalité. Une commande payée annulée par le client est remboursée selon les règles "
    "ci-dessous ; le remboursement est versé dans l'actif et sur le réseau du paiement.",
    "legal_en": _DEMO_EN
    + "Seller: (the operator's company name, legal form and address)\nRegistration number: (not set)\n"
    "VAT number: (not set)\nContact: (the operator's e-mail address)\nHost of the site: (the hosting provider's "
    "name and address)",
    "legal_fr": _DEMO_FR
    + "Vendeur : (raison sociale, forme juridique et adresse de l'opérateur)\nNuméro d'immatriculation : (non "
    "renseigné)\nNuméro de TVA : (non renseigné)\nContact : (adresse e-mail de l'opérateur)\nHébergeur du site : "
    "(nom et adresse de l'hébergeur)",
    "privacy_en": _DEMO_EN
    + "The portal keeps what a booking needs: your name, e-mail, organisation, SSH public keys and the order's "
    "details, to deliver the service and keep accounting records. No account, no tracking cookie. Write to the "
    "contact of the legal notice to access or delete your data.",
    "privacy_fr": _DEMO_FR
    + "Le portail conserve ce dont une réservation a besoin : vos nom, e-mail, organisation, clés SSH publiques et "
    "le détail de la commande, pour fournir le service et tenir la comptabilité. Ni compte, ni cookie de suivi. "
    "Écrivez au contact des mentions légales pour consulter ou effacer vos données.",
}
