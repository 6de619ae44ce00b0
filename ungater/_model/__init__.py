"""The model: plain, immutable views of the objects ungater reasons about, and the config schema.

The bottom layer. Pure data and its validation: no I/O, no clock, nothing imported from the
other folders. Everything above reads these types; nothing here knows who reads them.
"""
