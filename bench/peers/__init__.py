"""``python -m bench --peers``: this project and its peers measured in one run (see ``run``)."""
