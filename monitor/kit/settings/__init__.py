"""The settings kit: declare a file's keys on dataclasses (kind, default, help in one place) and read
a YAML mapping against them, every problem one `ConfigError(file, key, problem)`.

    reader.py   ConfigError, key(), Reader (sections, closed mappings), read_yaml
    values.py   durations, URLs, secrets: the plain values and their checks
    kinds.py    the kinds of a single value (Int, Duration, Url, SecretFile, ...)
    shapes.py   kinds made of sections: Sub, ListOf, MapOf, Tagged, group()

Generic: it knows nothing of headroom's sections, which are declared next to their owners.
"""
from monitor.kit.settings.reader import ConfigError, Reader, key, read_yaml  # noqa: F401
