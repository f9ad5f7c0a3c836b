"""The location of this machine's public IP address: `get_ip_lat_long` (Zeus 0.16's path).

The location is what carbon intensity is looked up by (`zeus.monitor.carbon`), so a failure
raises that module's `ZeusCarbonIntensityHTTPError`, which is defined here, below it, and
re-exported there. `check_location` is the one check of a `location=` argument (the carbon
and price clients').
"""

from __future__ import annotations

from zeus.exception import ZeusBaseError
from zeus.util import http

__all__ = ["ZeusCarbonIntensityHTTPError", "get_ip_lat_long"]


class ZeusCarbonIntensityHTTPError(ZeusBaseError):
    """The carbon-intensity service could not be reached or answered with an error status.

    Also raised when this machine's location, which the intensity is looked up by, cannot be
    had (`get_ip_lat_long`).
    """


def check_location(location: tuple[float, float]) -> tuple[float, float]:
    """`location` as `(latitude, longitude)` floats, checked to lie within the degree ranges.

    Raises:
        ValueError: a latitude outside [-90, 90] or a longitude outside [-180, 180] (the message
            names the location); not a pair of numbers (as unpacking and `float` raise it).

    """
    lat, lon = (float(x) for x in location)
    if not (-90 <= lat <= 90 and -180 <= lon <= 180):
        raise ValueError(f"location={location!r}: expected (latitude, longitude) in degrees")
    return lat, lon


def get_ip_lat_long(
    url: str = "https://ipinfo.io/json", timeout: float = 10.0
) -> tuple[float, float]:
    """Latitude and longitude of this machine's public IP address, from ipinfo.io.

    Args:
        url: The service that answers `{"loc": "<lat>,<lon>", ...}`.
        timeout: Seconds to wait for an answer.

    Returns:
        (latitude, longitude) in degrees.

    Raises:
        ZeusCarbonIntensityHTTPError: the service is unreachable, or its answer has no `loc`.

    """

    def no_location(why: str) -> ZeusCarbonIntensityHTTPError:
        return ZeusCarbonIntensityHTTPError(
            f"Cannot tell this machine's location from {url}: {why}; pass the location "
            "(latitude, longitude) yourself"
        )

    def failed(failure: http.Failure) -> ZeusCarbonIntensityHTTPError:
        if failure.error is not None:
            return no_location(f"{type(failure.error).__name__}: {failure.error}")
        return no_location(f"HTTP {failure.status}")

    service = http.Service("ipinfo", http.ErrorMap(transport=failed, status=failed, body=failed))
    with http.open_client(timeout=timeout) as client:
        body = service.send_json(client, "GET", url)
    try:
        lat, lon = (float(x) for x in body["loc"].split(","))
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise no_location(f"{type(e).__name__}: {e}") from e
    return lat, lon
