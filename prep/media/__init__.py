"""Media metadata of a part, read from its header bytes: which parts count as media (energon's three
filters, `filter`), what an image header says (`images`), and one part described as energon's
`media_metadata` row (`describe`).

A layer beside the tar format: it knows bytes and names, not shards or the index. JPEG, PNG, GIF and
WebP are read without any decoder library, from the few bytes each format needs; other image formats
go to Pillow, as energon does, when it is installed.
"""
