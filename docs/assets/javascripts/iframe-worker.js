/* A Worker made of a hidden iframe, for the docs opened from the file system (file://), where browsers refuse
 * `new Worker(url)`: the site's search runs in a worker. Material's offline plugin would load the same kind of shim
 * from unpkg.com; this one ships with the site, so nothing is fetched from another host. Served over HTTP, it does
 * nothing. */
(function () {
  "use strict";
  if (location.protocol !== "file:") return;

  function IFrameWorker(url) {
    var target = document.createDocumentFragment(); // an EventTarget of our own
    var self = this;
    this.onmessage = null;
    this.onerror = null;
    this.addEventListener = target.addEventListener.bind(target);
    this.removeEventListener = target.removeEventListener.bind(target);
    this.dispatchEvent = target.dispatchEvent.bind(target);
    var queue = [];
    var ready = false;
    var iframe = document.createElement("iframe");
    iframe.setAttribute("aria-hidden", "true");
    iframe.setAttribute("tabindex", "-1");
    iframe.style.display = "none";
    document.body.appendChild(iframe);
    var w = iframe.contentWindow;
    this._iframe = iframe;
    this._send = function (data) {
      w.dispatchEvent(new w.MessageEvent("message", { data: data }));
    };
    // What the worker posts comes to this side as a message event.
    w.postMessage = function (data) {
      var event = new MessageEvent("message", { data: data });
      self.dispatchEvent(event);
      if (typeof self.onmessage === "function") self.onmessage(event);
    };
    w.importScripts = function () {
      throw new Error("importScripts is not available in this worker (iframe-worker.js)");
    };
    var script = w.document.createElement("script");
    script.src = url;
    script.onload = function () {
      ready = true;
      queue.splice(0).forEach(self._send);
    };
    script.onerror = function () {
      var event = new ErrorEvent("error", { message: "cannot load " + url });
      self.dispatchEvent(event);
      if (typeof self.onerror === "function") self.onerror(event);
    };
    (w.document.body || w.document.documentElement).appendChild(script);
    this.postMessage = function (data) {
      if (ready) self._send(data);
      else queue.push(data);
    };
    this.terminate = function () {
      iframe.remove();
    };
  }

  window.Worker = IFrameWorker;
})();
