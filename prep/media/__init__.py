"""Media metadata of a part, read from its header bytes: which parts count as media (energon's three
filters, `filter`), what an image header says (`images`), what an audio/video header says (`av`, with
`pyav` for the formats whose numbers only a decoder gives), and one part described as energon's
`media_metadata` row (`describe`).

A layer beside the tar format: it knows bytes and names, not shards or the index. JPEG, PNG, GIF and
WebP images and WAV and FLAC audio are read without any library, from the few bytes each format needs;
other image formats go to Pillow and other audio/video formats to PyAV, as in energon, when installed.
"""
