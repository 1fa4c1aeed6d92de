"""``python -m retrograd ...`` runs the ``retrograd`` command."""
from .cli import main

raise SystemExit(main())
