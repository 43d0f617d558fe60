"""How a bundle file travels: the block layout, content-addressed chunks and their index pages."""
