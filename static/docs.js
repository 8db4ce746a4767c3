// Starts the API docs page (templates/api_docs.html) from the vendored Swagger UI or Redoc bundle.
// It lives here, not inline, so that the docs pages keep script-src 'self'.
(function () {
  "use strict";
  var el = document.getElementById("api-docs");
  if (!el) return;
  var url = el.getAttribute("data-openapi");
  if (el.getAttribute("data-ui") === "swagger") {
    window.ui = window.SwaggerUIBundle({
      url: url,
      dom_id: "#api-docs",
      deepLinking: true,
      validatorUrl: null, // the default asks validator.swagger.io about our schema
      presets: [window.SwaggerUIBundle.presets.apis],
      layout: "BaseLayout",
    });
  } else {
    window.Redoc.init(url, { hideDownloadButton: false }, el);
  }
})();
