from django.conf import settings


def portal(request):
    """What every page's layout needs: the price currency and whether this is a development build."""
    return {"PRICE_CURRENCY": settings.PRICE_CURRENCY, "DEBUG_BUILD": settings.DEBUG}
