"""Django's SQLite backend with the database's write lock queued in the process
(``base.DatabaseWrapper``); set as ``ENGINE`` by ``omnigent_site/settings.py``."""
