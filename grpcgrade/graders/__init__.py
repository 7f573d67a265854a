"""The built-in graders, one package per family. Each family is a plugin of the core: it registers its
graders through the same `register_graders` hook a third-party package uses."""
