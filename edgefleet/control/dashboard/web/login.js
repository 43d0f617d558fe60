// The login page: say why the last attempt failed.
"use strict";
if (new URLSearchParams(location.search).has("failed")) document.getElementById("failed").hidden = false;
