"""The typer CLI: thin commands that call the library. One module per command group."""
