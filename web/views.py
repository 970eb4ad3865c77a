"""The pages: each one is a template and a script module; the data comes from the API.

A page view only decides who is looking (the same identity rules as the API:
the proxy's header, a Django login, local single-user mode) and hands the
template the few facts the script needs to start. Everything the page shows and
every change it makes goes through the public HTTP API, in the browser.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

from django.conf import settings
from django.contrib.auth import logout
from django.contrib.auth.views import LoginView
from django.http import HttpRequest, HttpResponse, HttpResponseBase, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_POST
from rest_framework.exceptions import APIException
from rest_framework.request import Request

from omnigent_site import signin_limits
from omnigent_site.authentication import (
    ForwardedHeaderAuthentication,
    LocalSingleUserAuthentication,
)
from omnigent_site.users import is_admin

from .security import with_page_headers

PageView = Callable[..., HttpResponseBase]


def page_identity(request: HttpRequest) -> tuple[Any, str] | None:
    """The user looking at the page and how they were identified, or None.

    ``login``: a Django login session (the page offers sign-out); ``header``: the
    authenticating proxy's header; ``local``: local single-user mode.
    """
    if request.user.is_authenticated:
        return request.user, "login"
    wrapped = Request(request)
    for source, authenticator in (
        ("header", ForwardedHeaderAuthentication()),
        ("local", LocalSingleUserAuthentication()),
    ):
        try:
            found = authenticator.authenticate(wrapped)
        except APIException:  # a bad header; a POST to a page (cross_site's rules)
            return None
        if found is not None:
            return found[0], source
    return None


def signed_in(view: PageView) -> PageView:
    """Send a visitor without identity to the sign-in page."""

    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        identity = page_identity(request)
        if identity is None:
            query = urlencode({"next": request.get_full_path()})
            return HttpResponseRedirect(f"{reverse('web-signin')}?{query}")
        request.page_user, request.page_source = identity  # type: ignore[attr-defined]
        return view(request, *args, **kwargs)

    wrapper.__name__ = view.__name__
    wrapper.__doc__ = view.__doc__
    return wrapper


def _page(request: HttpRequest, template: str, *, name: str, **boot: Any) -> HttpResponse:
    user = request.page_user  # type: ignore[attr-defined]
    context = {
        "page": name,
        "user_name": user.get_username(),
        "can_sign_out": request.page_source == "login",  # type: ignore[attr-defined]
        "boot": {"user_id": user.get_username(), "is_admin": is_admin(user), **boot},
    }
    return render(request, template, context)


@with_page_headers
@signed_in
def sessions_page(request: HttpRequest) -> HttpResponse:
    return _page(request, "web/sessions.html", name="sessions")


@with_page_headers
@signed_in
def new_session_page(request: HttpRequest) -> HttpResponse:
    return _page(request, "web/new_session.html", name="new")


@with_page_headers
@signed_in
def session_page(request: HttpRequest, session_id: str) -> HttpResponse:
    # Whether the session exists and may be read is the API's answer, shown by the script.
    return _page(request, "web/session.html", name="session", session_id=session_id)


@with_page_headers
@signed_in
def inbox_page(request: HttpRequest) -> HttpResponse:
    return _page(request, "web/inbox.html", name="inbox")


@with_page_headers
@signed_in
def runners_page(request: HttpRequest) -> HttpResponse:
    return _page(request, "web/runners.html", name="runners")


@with_page_headers
@signed_in
def webhooks_page(request: HttpRequest) -> HttpResponse:
    return _page(request, "web/webhooks.html", name="webhooks")


@with_page_headers
@signed_in
def schedules_page(request: HttpRequest) -> HttpResponse:
    return _page(request, "web/schedules.html", name="schedules")


@with_page_headers
@signed_in
def usage_page(request: HttpRequest) -> HttpResponse:
    return _page(request, "web/usage.html", name="usage")


class SignInView(LoginView):
    """Django's login form, on a page with the same headers as the others."""

    template_name = "web/signin.html"
    redirect_authenticated_user = True

    def get_default_redirect_url(self) -> str:
        return reverse("web-sessions")

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        return with_page_headers(super().dispatch)(request, *args, **kwargs)

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        context["page"] = "signin"
        context["local_mode"] = settings.OMNIGENT_LOCAL_SINGLE_USER
        return context

    def form_invalid(self, form: Any) -> HttpResponse:
        wait_s = getattr(self.request, signin_limits.WAIT_ATTRIBUTE, None)
        if wait_s is None:
            return super().form_invalid(form)
        # Too many failed sign-ins (omnigent_site/signin_limits.py): the password was
        # not checked; say so, and when to try again.
        minutes = max(1, math.ceil(wait_s / 60))
        context = self.get_context_data(form=form, retry_minutes=minutes)
        response = self.render_to_response(context, status=429)
        response["Retry-After"] = str(max(1, math.ceil(wait_s)))
        return response


@require_POST
def sign_out(request: HttpRequest) -> HttpResponseRedirect:
    logout(request)
    return HttpResponseRedirect(reverse("web-signin"))
