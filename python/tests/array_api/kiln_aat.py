# python/tests/array_api/kiln_aat.py: the module the Array API standard's test suite imports (ARRAY_API_TESTS_MODULE=kiln_aat): kiln.array_api, plus the two names without which the suite cannot import.
"""kiln.array_api for array-api-tests.

The suite (at the pinned commit scripts/array_api.sh fetches) takes max()
over the namespace's complex dtypes when it imports, even for the 2021.12
revision of the standard, which has none; kiln has no complex dtypes. So
this module adds the two names as placeholders: no kiln function accepts
them (every use is a kiln error naming the dtype), and the tests that draw
them are in xfails.txt. Everything else is kiln.array_api itself.
"""
import kiln.array_api as _xp
from kiln.array_api import *  # noqa: F401,F403
from kiln.array_api import __array_api_version__, __array_namespace_info__  # noqa: F401

globals().update({name: getattr(_xp, name) for name in dir(_xp) if not name.startswith("__")})


class _Placeholder:
    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return self.name


complex64 = _Placeholder("complex64")
complex128 = _Placeholder("complex128")
