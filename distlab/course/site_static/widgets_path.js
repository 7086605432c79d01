/* Where the Jupyter widget manager (embed-amd.js) finds its icon fonts: it takes them from its
 * AMD module's address, which require.js makes from the module's name at the site's root unless
 * told. This config, read by require.js when it loads next, points the package at _static/. */
var require = {paths: {"@jupyter-widgets/html-manager":
  document.currentScript.src.replace(/widgets_path\.js.*$/, "html-manager")}};
