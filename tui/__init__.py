"""The mas-lab dashboard (Textual). It talks to the core only through the run store and the
control API, so a headless run can be watched live or replayed later."""
