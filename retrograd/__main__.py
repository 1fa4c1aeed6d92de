"""``python -m retrograd ...`` runs the ``retrograd`` command."""
from .cli.main import main

raise SystemExit(main())
