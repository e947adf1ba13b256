/* layer-link.c: the main of the layer-link-* programs (meson.build), which
 * link one layer whole with the layers below it and are never run. */
int
main(void)
{
  return 0;
}
